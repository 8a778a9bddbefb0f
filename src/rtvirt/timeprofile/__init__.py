"""Statistics over a run's time, from one pass over its samples: per-window levels and maxima, cumulative marks,
the largest samples, a thinned series (windows.py), and the levels between timeline events (levels.py). Pure
computation below the store: the digest is made of it when a run is stored."""
