"""A run directory's files read (and eval rows written) in one place: `rundir.files`."""
