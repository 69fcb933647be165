"""``tf.train.Example`` without TensorFlow or protobuf, for trainers and format plugins.

The public face of the record kernel's Example codecs: ``parse(record)`` decodes an Example
into ``{name: [values]}`` (``prefetchd.kernel.example_decode``, which says what it accepts);
``encode_example(features)`` writes one, as the built-in formats do
(``prefetchd.kernel.example_encode``)::

    from prefetchd.example import parse

    features = parse(record)  # {"key": [b"..."], "data": [b"..."], "line_number": [3], ...}
"""

from __future__ import annotations

from prefetchd.kernel.example_decode import ExampleError, FeatureList, parse
from prefetchd.kernel.example_encode import FeatureValue, encode_example

__all__ = ["ExampleError", "FeatureList", "FeatureValue", "encode_example", "parse"]
