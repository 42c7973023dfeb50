"""``python -m tether.run._rank_main``: the process of a started training rank (1..N-1).

Its own module so that the exit handler that skips the interpreter's
teardown (``tether/_exit.py``) is registered before torch is imported: the
rank, like the ``tether`` command, then leaves at once instead of after
seconds of garbage collection, which rank 0 would wait for at the end of
every multi-process run.
"""

from tether import _exit


def _main() -> None:
    from tether.run._ranks import rank_main

    rank_main()


if __name__ == "__main__":
    _exit.run(_main)
