"""``python -m dssup`` runs the CLI (same as the ``dssup`` script)."""

from dssup.cli import main

main()
