"""Cap policies, qualification gates and arms (`policy.arms`): imported by `trainer` and `cards` alike."""
