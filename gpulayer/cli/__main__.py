"""``python -m gpulayer.cli``: the same as the ``gpulayer`` script."""

from gpulayer.cli import main

main()
