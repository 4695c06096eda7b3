"""Schedule search: CP-SAT repetend search, completion and baselines."""

from tessel_jax.search.completion import CompletionError
from tessel_jax.search.errors import (InfeasibleScheduleError,
                                      SearchTimeoutError)
from tessel_jax.search.min_memory import (min_memory_at_period,
                                          min_memory_limit, smallest_memory,
                                          smallest_memory_repetend)
from tessel_jax.search.period_bounds import period_lower_bound
from tessel_jax.search.repetend import search_repetend

__all__ = [
    "CompletionError", "InfeasibleScheduleError", "SearchTimeoutError",
    "min_memory_at_period", "min_memory_limit", "period_lower_bound", "search_repetend",
    "smallest_memory", "smallest_memory_repetend",
]
