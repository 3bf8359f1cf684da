"""Folders on disk that become served objects: export, the bundle formats, and loading them verified.

    bundle_files.py       what every bundle-like folder shares: manifest name, sha256, kind, staged writes
    model_bundle.py       the model bundle (Bundle, Manifest; dense program + embeddings + schema + workflow)
    export.py             a trained RecModel or checkpoint -> a model bundle
    any_bundle.py         load: any bundle, by its manifest's kind -> the served object (the one loading path)
    bundle_loader.py      a model bundle -> a running InferenceModel (parameter server, updates); ServeOptions
    gbm_bundle.py         the GBM bundle -> GBMModel
    next_items_bundle.py  the next-items bundle -> NextItemsModel
    pipeline_bundle.py    the pipeline bundle -> a PipelineRunner with its stores, index, encoder and ranker
    version_delta.py      a version delta: a new version made from a loaded one plus what changed

Above store/, runtime/ and pipeline/ (what the folders are loaded into), below http/.
"""
