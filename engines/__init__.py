"""Backends behind one small interface each: inference (generation) and training engines. Know nothing of the graph."""
