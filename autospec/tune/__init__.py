"""autospec tune: Optuna sweeps over policy files (space, objective, study, export)."""
