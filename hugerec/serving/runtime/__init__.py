"""What answers a request in process, once loaded: the served models and their request language.

    inference_model.py      InferenceModel: parameter-server lookups + pooling + the dense program; ModelInputs
    program.py              ServedProgram: the exported dense program and its fastest equivalent call
    gbm_model.py            GBMModel: trees scored by forest.py's Numba kernel (or the library)
    forest.py               a forest as flat arrays, one Numba kernel
    next_items_model.py     NextItemsModel: a sequential model's exact top-k next items
    batching.py             DynamicBatcher: concurrent requests merged into one model call
    inference_protocol.py   the Open Inference Protocol v2: decode, validate, encode; RequestError, Signature
    request_preprocessor.py RequestPreprocessor: /predict's raw rows -> the fitted workflow -> ModelInputs

Between the store (rows) and everything that is built from files (bundles/) or speaks HTTP (http/):
the runtimes read no files and know no web framework, so a pipeline (pipeline/) composes them and a
bundle (bundles/) produces them without either importing the other.
"""
