"""comfy_memx's benchmarks: run from a checkout as ``python -m bench.<case>`` (``bench.run`` for the table of
cases, ``bench.soak``, ``bench.retention``, ``bench.gpu_check``, ``bench.exposed``, ``bench.fleet_series``); the cases
import each other as modules of this package."""
