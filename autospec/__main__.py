"""`python -m autospec ...` = the `autospec` command."""
from autospec.cli import main

main()
