"""Arena core: the harness, knowing nothing of any one method."""
