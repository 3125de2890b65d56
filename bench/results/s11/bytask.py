import sys, re, collections
path = sys.argv[1]
skip = re.compile(r'^(tokio::runtime|tracing::instrument|<tracing::instrument|core::|<core::|std::|<std::|alloc::|<alloc::|\[unknown\]|catch_unwind|__rust|<F as|tokio::task::|tokio::util|<tokio::runtime|<futures_util::future::future::Map|<futures_util::future::future::map)')
tasks = collections.Counter(); leaves = collections.defaultdict(collections.Counter); comms = collections.Counter()
incl = collections.Counter()
total = 0
def flush(comm, frames):
    global total
    if not frames: return
    total += 1
    comms[comm] += 1
    syms = [f for f in frames]
    # root is last
    task = comm
    rev = list(reversed(syms))
    for i, s in enumerate(rev):
        if 'Harness' in s and '::poll' in s:
            for t in rev[i+1:]:
                if not skip.match(t):
                    task = comm + ' | ' + t[:110]; break
            break
    tasks[task] += 1
    leaves[task][syms[0][:90]] += 1
    seen = set()
    for s in syms:
        for key in sys.argv[2:]:
            if key in s and key not in seen:
                seen.add(key); incl[key] += 1
comm=None; frames=[]
for line in open(path, errors='replace'):
    line=line.rstrip('\n')
    if not line.strip():
        flush(comm, frames); comm=None; frames=[]; continue
    if not line.startswith((' ', '\t')):
        comm=line.split()[0]; frames=[]; continue
    parts=line.strip().split(' ',1)
    sym=parts[1] if len(parts)>1 else '?'
    sym=re.sub(r'\+0x[0-9a-f]+$','',sym).strip()
    sym=re.sub(r' \(.*\)$','',sym)
    frames.append(sym)
flush(comm, frames)
print('samples', total)
for c,n in comms.most_common(): print(f'{100*n/total:5.1f}% comm {c}')
for t,n in tasks.most_common(25):
    print(f'{100*n/total:5.1f}% {t}')
    for l,m in leaves[t].most_common(6): print(f'        {100*m/total:5.2f}% {l}')
for k,n in incl.most_common(): print(f'incl {100*n/total:5.1f}% {k}')
