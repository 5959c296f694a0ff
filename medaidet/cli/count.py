"""``medaidet count``: predicted against annotated cell counts (notebook 05)."""


def add_parser(commands) -> None:
    from medaidet.evaluation.count import add_count_parser
    add_count_parser(commands)
