"""Plain data, no torch: what a run is asked (config, items, schedules), what a cell computes (the declared
pipeline), what it leaves (records), and the engines and cache kinds known by name, so a config is checked
and a run priced before anything loads."""
