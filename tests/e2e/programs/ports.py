"""A TCP port for a launcher's store, shared by the test programs and the tests that start them."""
import random
import socket


def free_port():
    """A port no one holds now, drawn below the kernel's ephemeral range. A port the kernel picks
    (bind to 0) lies in that range, where it can become the local end of another process's
    connection, or a gloo listener, before the launcher binds it; a launcher then joins a foreign
    store or none. Below the range only an explicit bind takes a port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()
    for _ in range(1000):
        port = draw.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in 10000-{low}")
