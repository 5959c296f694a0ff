"""``medaidet doctor``: the environment checks (notebook 00)."""


def add_parser(commands) -> None:
    p = commands.add_parser("doctor", help="check the environment; exit 1 if a check fails")
    p.add_argument("--gpu-smoke", action="store_true",
                   help="also run a small real GPU workload with CUDA_LAUNCH_BLOCKING=1")
    p.set_defaults(func=_doctor)


def _doctor(args) -> int:
    from medaidet.env.doctor import run_doctor
    report = run_doctor(gpu_smoke=args.gpu_smoke)
    print(report)
    return 1 if report.failed else 0
