"""Plan file formats of other systems: import a plan as a ``PlanStrategy``, export one to their format."""
