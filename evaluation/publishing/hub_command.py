"""What the two publishing commands (publish.py, publish_metric.py) share: the upload options and the lines they end
with."""

import argparse



def add_upload_options(parser: argparse.ArgumentParser, repository: str, commit_message: str) -> None:
    """--private, --revision, --commit_message and --dry-run; `repository` names what is created ("repository")."""
    parser.add_argument("--private", action="store_true", help=f"create the {repository} as private")
    parser.add_argument("--revision", default="main", help="branch to upload to (created if missing)")
    parser.add_argument("--commit_message", default=commit_message)
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true", help="stage and list only")


def upload_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of publish_model and publish_metric that add_upload_options parsed."""
    return dict(private=args.private, revision=args.revision, commit_message=args.commit_message, dry_run=args.dry_run)


def print_outcome(result: dict, args: argparse.Namespace, target: str) -> None:
    """What a command did: the folder it staged (if any) and the files, then the upload's commit or, with
    --dry-run, where it would have gone (`target`: "the Space user/name", say)."""
    if result["folder"] is not None:
        print(f"Staged {result['folder']}:")
    print(result["files"])
    if args.dry_run:
        print(f"Dry run: nothing uploaded (would upload to {target}@{args.revision}).")
    else:
        print(f"Uploaded to {result['commit_url']}")
