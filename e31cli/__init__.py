"""``e31``: the console from a terminal and from scripts, through the public API only."""
