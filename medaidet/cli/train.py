"""``medaidet train``: the course recipe from a terminal (notebook 03)."""


def add_parser(commands) -> None:
    from medaidet.training.train import add_train_parser
    add_train_parser(commands)
