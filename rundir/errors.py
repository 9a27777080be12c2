"""The error every reader of a run's files refuses with (its own module so that rundir.archive, which
rundir.files imports, can derive its ArchiveError from it: a damaged published archive is then refused by
every command that refuses a damaged run file, in one line)."""


class RunFileError(ValueError):
    """A run directory's file we cannot read as docs/CONTRACTS.md says; the message names file and line."""
