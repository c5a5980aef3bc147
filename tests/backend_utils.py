"""Helpers shared by the test modules."""

import keras


def compiled(model, function):
    """`function(*args)`, which reads `model`'s variables, compiled under JAX.

    Eager JAX compiles every op on its first use, which makes a tiny model's
    first forward pass take a minute on 2 cores; one `jax.jit` per input shape
    takes seconds. The variables are passed in at every call, so assigning
    new values to them between calls works as in eager mode. Under
    TensorFlow and torch `function` is returned unchanged (eager).
    """
    if keras.backend.backend() != "jax":
        return function
    import jax

    if not model.built:
        model.build()
    variables = model.variables

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return function(*args)

    jitted = jax.jit(stateless)
    return lambda *args: jitted([variable.value for variable in variables], *args)
