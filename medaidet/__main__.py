"""``python -m medaidet`` works from a source checkout before chainer exists."""
from medaidet.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
