"""Every file of a run directory, in one place (docs/CONTRACTS.md): names and rows (`rundir.files`), run.json
(`rundir.run_json`), `stateNNN/` (`rundir.state`), `stepNNN/` manifests (`rundir.step`), the run's lock
(`rundir.lock`), what a resume does to the files (`rundir.resume`) and re-grading (`rundir.regrade`)."""
