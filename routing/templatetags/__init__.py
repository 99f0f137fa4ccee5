"""Template tags of the ops pages (a web surface): formatting from routing.ops.display."""
