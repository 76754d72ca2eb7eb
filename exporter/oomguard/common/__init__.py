"""Parts every product uses that import nothing of oomguard's: the event kinds, the engines' HTTP client,
small helpers."""
