import os, sys, time
p = sys.argv[1]; n = int(sys.argv[2])
open(p, "w").close()
for _ in range(200):
    try: os.getxattr(p, "user.nope")
    except OSError: pass
t = time.perf_counter()
for _ in range(n):
    try: os.getxattr(p, "user.nope")
    except OSError: pass
print(f"{(time.perf_counter()-t)/n*1e6:.1f}")
