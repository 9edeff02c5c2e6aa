"""The benchmark behind ``make bench``: every operator's kernel and end-to-end throughput on one Vulkan
device, next to that device's own copy ceiling, a host memcpy and CPU peers (numpy, and torch or
onnxruntime where installed); then the HTTP service end to end (``bench.service``) next to a bare
uvicorn echo (``bench.echo``) and a raw loopback socket. It prints the results and writes them to
bench/RESULTS.md."""
