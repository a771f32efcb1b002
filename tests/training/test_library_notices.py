"""Runs print no library notice that does not apply to them (training/launch/library_notices.py)."""

import logging

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from conftest import tiny_two_tower
from training.launch.library_notices import DEEPSPEED_LOGGER, quiet_inapplicable_notices


def test_checkpoints_store_the_tied_weight_once_without_a_warning(tmp_path, caplog):
    accelerator = Accelerator(cpu=True)
    quiet_inapplicable_notices(accelerator)
    model = accelerator.prepare(tiny_two_tower(vocab_size=64))
    saved = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with caplog.at_level(logging.WARNING):
        accelerator.save_state(str(tmp_path / "checkpoint"))
    assert "Removed shared tensor" not in caplog.text
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(str(tmp_path / "checkpoint"))
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in saved.items())
    assert model.lm_head.decoder.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_a_run_without_deepspeed_filters_its_cpu_notice_only():
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type != DistributedType.DEEPSPEED
    quiet_inapplicable_notices(accelerator)
    logger, records = logging.getLogger(DEEPSPEED_LOGGER), []
    handler = logging.Handler()
    handler.emit = records.append  # DeepSpeed's logger does not propagate once DeepSpeed has set it up
    logger.addHandler(handler)
    try:
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        logger.warning("another notice")
    finally:
        logger.removeHandler(handler)
    assert [record.getMessage() for record in records] == ["another notice"]
