"""Build steps. Each takes what it needs and returns a typed result; manifests are assembled from those.

check -> [fusion] -> precision -> optimize -> reload (run on the golden inputs) -> package (atomic publish)
"""
