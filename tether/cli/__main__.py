"""``python -m tether.cli`` is the ``tether`` command (``torchrun -m tether.cli train ...``)."""

from tether.cli import main

main()
