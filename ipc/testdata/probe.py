"""Reports, as one JSON line, which Python modules the interop tests can use."""

import json
import sys

out = {"python": sys.version.split()[0], "cuda_core": None, "torch": None}
for name in ("cuda.core", "cuda.core.experimental"):
    try:
        m = __import__(name, fromlist=["Device"])
        if hasattr(m, "DeviceMemoryResource"):
            import importlib.metadata as md

            try:
                out["cuda_core"] = md.version("cuda-core")
            except Exception:  # noqa: BLE001
                out["cuda_core"] = "unknown"
            out["cuda_core_module"] = name
            break
    except Exception as e:  # noqa: BLE001
        out["cuda_core_error"] = str(e)
try:
    import torch

    if torch.cuda.is_available():
        out["torch"] = torch.__version__
    else:
        out["torch_error"] = "torch.cuda.is_available() is False"
except Exception as e:  # noqa: BLE001
    out["torch_error"] = str(e)
print(json.dumps(out))
