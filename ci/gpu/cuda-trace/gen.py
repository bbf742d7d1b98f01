"""Generates what trace.c includes and links with, into OUT_DIR:

- tramps.h: 2048 slot trampolines (each calls tcall with its index);
- fwd.c: every function REAL exports that trace.c does not define itself, as a jump to
  the same function of the library REAL_CUDA names at run time (a stub answering
  CUDA_ERROR_NOT_SUPPORTED where that library lacks it).

Usage: python3 gen.py REAL_LIBCUDA TRACE_C OUT_DIR
"""
import os
import re
import subprocess
import sys

real, trace_c, out = sys.argv[1], sys.argv[2], sys.argv[3]
NT = 2048
own = set(re.findall(r"^CUresult (cu\w+)\(", open(trace_c).read(), re.M))
syms = []
nm = subprocess.run(["nm", "-D", "--defined-only", real], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    p = line.split()
    if len(p) == 3 and p[1] in "Tt" and p[2] not in own and re.match(r"^\w+$", p[2]):
        syms.append(p[2])
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "tramps.h"), "w") as f:
    for i in range(NT):
        f.write(f"static u64 T{i}(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f) "
                f"{{ return tcall({i}, a, b, c, d, e, f); }}\n")
    f.write("static void *tramp[NT] = {" + ",".join(f"T{i}" for i in range(NT)) + "};\n")
with open(os.path.join(out, "fwd.c"), "w") as f:
    f.write("#include <dlfcn.h>\nvoid *trace_real(void);\n")
    f.write("static int not_supported(void) { return 801; }\n")
    for s in syms:
        f.write(f'void *p_{s} __attribute__((visibility("hidden")));\n')
        f.write(f'__asm__(".globl {s}\\n.type {s},@function\\n{s}:\\n\\tjmp *p_{s}(%rip)\\n");\n')
    f.write("__attribute__((constructor)) static void fwd_init(void) {\n")
    f.write("    void *r = trace_real(), *p;\n")
    for s in syms:
        f.write(f'    p = dlsym(r, "{s}"); p_{s} = p ? p : (void *)not_supported;\n')
    f.write("}\n")
print(f"{len(syms)} functions forwarded", file=sys.stderr)
