"""How examples reach the replicas: tf.data pipelines split per replica, seekable
streams, and environments."""
