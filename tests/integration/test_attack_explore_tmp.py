import os
import pytest
from conftest import Yard, open_yard
from shellyard.runner.protocol import SandboxPolicy
MIB = 1 << 20
pytestmark = pytest.mark.timeout(600)

async def test_tmp_inodes(home):
    policy = SandboxPolicy(memory_limit_bytes=128 * MIB)
    plane, rid, daemon = await open_yard(home, "local", policy)
    try:
        y = Yard(plane, rid, home, daemon)
        before = int(open("/proc/meminfo").read().split("MemAvailable:")[1].split()[0])
        r = await y.run("cd /tmp && python3 -c \"\nimport os\nfor d in range(400):\n  os.mkdir(str(d))\n  for i in range(5000): open(f'{d}/{i}x'*1,'w').close()\n  print(d, flush=True)\n\" | tail -1; df -i /tmp | tail -1", background=True)
        v = await plane.executions.wait(r.execution_id, 400)
        st = await y.runner.status(r.execution_id)
        lg = await plane.executions.logs(r.execution_id)
        print(st.limit, st.exit_code, st.peak_memory_bytes, st.error, lg.data[-300:])
        print("memavail before", before, "kB")
    finally:
        await plane.aclose()
