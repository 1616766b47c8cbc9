"""The one exception the importer raises for bad input: its message is the
whole one-line error the command prints."""


class ImportFailure(Exception):
    pass
