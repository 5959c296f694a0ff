"""``medaidet batch-size``: the largest batch that fits, and memory per batch size (08)."""


def add_parser(commands) -> None:
    from medaidet.scaling.memory import add_batch_size_parser
    add_batch_size_parser(commands)
