"""Every figure of the reports and the study is saved by report.save_figure as a palette PNG: the picture
matplotlib renders, within a small colour error on a few antialiased pixels, in a fraction of the bytes."""

import io
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from twotower.evaluation.scoring import report
from twotower.evaluation.scoring.report import palette_image, repack_png

# A palette of 256 colours (median cut) holds a plot's flat colours exactly; the antialiased edges and the shades of
# overlapping translucent markers take the nearest palette colour. On the scoring report's densest figure (thousands
# of translucent points, 1,600 colours): a pixel's largest channel error (of 255) is 0.25 on average, above 8 for at
# most 1% of the pixels and nowhere above 48 (measured: 0.07, 0.25%, 37).
MEAN_ERROR, LARGE_ERROR, LARGE_SHARE, MAX_ERROR = 0.25, 8, 0.01, 48


def scored_table(num_types=4000, seed=0):
    """A per-token table with what plot_logprob_scatter reads: each type's mean log-prob per tower, its preferred
    tower."""
    rng = np.random.default_rng(seed)
    logprob = rng.normal(-6.0, 2.0, num_types)
    towers = logprob + rng.normal(0.0, 0.4, (2, num_types))
    return pd.DataFrame({"mean_logprob_tower0": towers[0], "mean_logprob_tower1": towers[1],
                         "preferred_tower": (towers[1] > towers[0]).astype(int)})


def test_a_report_figure_is_saved_as_a_palette_png_of_the_rendered_picture(tmp_path, monkeypatch):
    rendered = {}
    write = report.write_palette_png

    def recording(image, path):  # the picture matplotlib rendered, as save_figure hands it on
        rendered["pixels"] = np.asarray(image.convert("RGB"))
        rendered["rgba_png"] = io.BytesIO()
        image.save(rendered["rgba_png"], format="PNG")
        return write(image, path)

    monkeypatch.setattr(report, "write_palette_png", recording)
    path = tmp_path / "logprob_scatter.png"
    report.plot_logprob_scatter(scored_table(), path)
    expected = rendered["pixels"]
    assert len(np.unique(expected.reshape(-1, 3), axis=0)) > 256  # the palette must choose
    assert sorted(item.name for item in tmp_path.iterdir()) == [path.name]  # written atomically: no leftovers
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == expected.shape  # the same size
    error = np.abs(pixels.astype(int) - expected.astype(int)).max(axis=-1)
    assert error.mean() <= MEAN_ERROR and error.max() <= MAX_ERROR
    assert (error > LARGE_ERROR).mean() <= LARGE_SHARE
    assert path.stat().st_size < rendered["rgba_png"].getbuffer().nbytes / 2


def test_a_figure_of_few_colours_keeps_every_pixel_and_repacking_it_is_idempotent(tmp_path):
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (200, 3), dtype=np.uint8)
    pixels = colours[rng.integers(0, 200, (60, 90))]  # 200 colours: a palette holds each exactly
    alpha = np.full((60, 90, 1), 255, np.uint8)
    path = tmp_path / "earlier.png"
    Image.fromarray(np.concatenate([pixels, alpha], axis=-1), "RGBA").save(path)  # as savefig wrote them before
    assert repack_png(path)
    with Image.open(path) as image:
        assert image.mode == "P"
        np.testing.assert_array_equal(np.asarray(image.convert("RGB")), pixels)
    before = path.read_bytes()
    assert not repack_png(path)  # a palette PNG already: left as it is
    assert path.read_bytes() == before


def test_transparent_pixels_keep_their_alpha():
    pixels = np.zeros((10, 10, 4), np.uint8)
    pixels[..., 0], pixels[:5, :, 3], pixels[5:, :, 3] = 200, 0, 255
    image = palette_image(Image.fromarray(pixels, "RGBA"))
    assert image.mode == "P"
    np.testing.assert_array_equal(np.asarray(image.convert("RGBA"))[..., 3], pixels[..., 3])



def test_every_figure_is_saved_by_save_figure():
    """No other code path writes a figure: savefig is called in scoring/report.py alone."""
    repository = Path(__file__).resolve().parents[2]
    callers = sorted(path.relative_to(repository).as_posix()
                     for folder in ("evaluation", "training", "modeling_twotower", "scripts", "benchmarks")
                     for path in (repository / folder).rglob("*.py") if ".savefig(" in path.read_text(encoding="utf-8"))
    assert callers == ["evaluation/scoring/report.py"]
