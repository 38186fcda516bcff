"""The operations of benches/pjrt.rs through pypjrt (a pure-Python PJRT client), on the same
plugin, for a side-by-side comparison.

    python3 -m venv "$PYPJRT_VENV" && "$PYPJRT_VENV"/bin/pip install pypjrt==0.1.1
    "$PYPJRT_VENV"/bin/python benches/pjrt_pypjrt.py .pjrt/plugins/xla-cpu.so

Prints the median over repeated timed batches, like criterion's point estimate.
"""

import struct
import sys

import pypjrt

from peer_timing import median_batch_seconds

ADD = """module @add4 {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""

BIG = 64 << 20
F32 = 11


def median_seconds(fn, per_batch, batches):
    fn()
    return median_batch_seconds(fn, per_batch, batches)


def main():
    path = sys.argv[1]
    client = pypjrt.Client.create(path, options={"cpu_device_count": 1})
    with client.devices() as devices:
        dev = devices[0]
        exe = client.compile(ADD)
        four = bytearray(struct.pack("<4f", 1, 2, 3, 4))
        a = client.buffer_from_host(four, F32, [4], dev)
        b = client.buffer_from_host(four, F32, [4], dev)

        def run():
            (out,) = exe(a, b)
            out.close()

        t = median_seconds(run, 2000, 15)
        print(f"pypjrt execute_and_wait_add4: {t * 1e6:.2f} us")

        host = bytearray(b"\x07" * BIG)

        def upload():
            buf = client.buffer_from_host(host, F32, [BIG // 4], dev)
            buf.close()

        t = median_seconds(upload, 3, 15)
        print(f"pypjrt host_to_device_64MiB: {t * 1e3:.3f} ms = {BIG / t / 1e9:.2f} GB/s")

        on_device = client.buffer_from_host(host, F32, [BIG // 4], dev)
        back = bytearray(BIG)
        t = median_seconds(lambda: on_device.to_host(back), 3, 15)
        print(f"pypjrt device_to_host_64MiB: {t * 1e3:.3f} ms = {BIG / t / 1e9:.2f} GB/s")
        assert back == host


if __name__ == "__main__":
    main()
