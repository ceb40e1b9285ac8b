"""The ``quanta`` command line (``quanta.cli.main:main``)."""
