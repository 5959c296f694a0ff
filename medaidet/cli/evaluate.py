"""``medaidet evaluate``: VOC average precision of a weights file (notebook 04)."""


def add_parser(commands) -> None:
    from medaidet.evaluation.evaluate import add_evaluate_parser
    add_evaluate_parser(commands)
