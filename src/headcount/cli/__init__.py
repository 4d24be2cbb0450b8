"""The command line: a thin typer app over the layers below (nothing imports this package).

Holds the console script's entry ([`entry`][headcount.cli.entry]: Ctrl-C handled before the heavy imports, so this
``__init__`` imports nothing), the typer app ([`app`][headcount.cli.app]), one module per command area
(``commands``) and the functions behind the commands that are no single module's verb
([`api`][headcount.cli.api]).

May import: every other package.
"""
