"""Jaxpr-level passes (markers, partition, backward split, lowering); installed as tessel_jax.passes."""
