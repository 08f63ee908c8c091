"""Build steps. Each takes what it needs and returns a typed result; manifests are assembled from those.

build:   check -> [fusion] -> precision -> optimize -> compile -> reload -> [operators] -> encrypt -> loaders
         -> package (the loaders and package steps: package.py)
verify:  integrity -> loader
Each step's module is named after it; the order, the phases and when each applies: ortbuild.pipeline.stages.
"""
