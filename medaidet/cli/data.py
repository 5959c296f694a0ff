"""``medaidet data download|validate``: BCCD (notebook 01), and TXL-PBC's
re-annotation of it (``download --dataset txl-pbc``)."""

ROOT_HELP = "dataset root (default: $MEDAIDET_DATA, else the cache directory)"


def add_parser(commands) -> None:
    data = commands.add_parser("data", help="BCCD (and TXL-PBC): download, validate")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    p = data_commands.add_parser("download", help="fetch a dataset at its pinned commit, "
                                 "verify every file, print the dataset root")
    p.add_argument("--dataset", choices=("bccd", "txl-pbc"), default="bccd",
                   help="bccd (default), or txl-pbc: TXL-PBC, a re-annotation of 221 BCCD "
                   "images and of three other sources")
    p.add_argument("--root", default=None, help="dataset root to create (default: "
                   "$MEDAIDET_DATA for bccd, $MEDAIDET_TXL_PBC for txl-pbc, else the cache "
                   "directory)")
    p.add_argument("--force", action="store_true", help="download again even if verified "
                   "(replaces the dataset's own files only)")
    p.set_defaults(func=_download)
    p = data_commands.add_parser("validate", help="report every annotation defect; exit 1 "
                                 "when any is of severity error")
    p.add_argument("root", nargs="?", default=None, help=ROOT_HELP)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_validate)


def _download(args) -> int:
    from medaidet.data.download import download
    from medaidet.data.pinned import SOURCES
    print(download(SOURCES[args.dataset], root=args.root, force=args.force))
    return 0


def _validate(args) -> int:
    from medaidet.data.validate import validate_dataset
    report = validate_dataset(args.root)
    print(report.to_json() if args.json else report)
    return 0 if report.ok else 1
