#!/usr/bin/env python3
"""A delay line for the bench rig, where netem is not in the kernel.

Run inside a network namespace: it makes a TUN device, and every packet the
kernel routes into it comes back out of it DELAY_MS later, to be routed on
(the rig sends what the namespace addresses to its peer through the TUN
device, and what comes back out of it on to the veth; see net.py). With a
64 KB MTU on the path, a gigabit is about 2,000 packets a second, which a
Python loop carries easily.

    delayline.py NAME DELAY_MS   (runs until killed; prints "up" when ready)
"""

import collections
import fcntl
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def main():
    name, delay = sys.argv[1], float(sys.argv[2]) / 1000.0
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    print("up", flush=True)
    queue = collections.deque()  # (due, packet), in the order they came
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            os.write(fd, queue.popleft()[1])
        wait = max(0.0, queue[0][0] - now) if queue else 1.0
        for _ in poll.poll(wait * 1000.0):
            # Take all that is waiting before looking at the clock again.
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                queue.append((time.monotonic() + delay, packet))
                if not select.select([fd], [], [], 0)[0]:
                    break


if __name__ == "__main__":
    main()
