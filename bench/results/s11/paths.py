import sys, re, collections
path, key = sys.argv[1], sys.argv[2]
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 6
c = collections.Counter(); total=0; n=0
comm=None; frames=[]
def flush():
    global total, n
    if not frames: return
    total += 1
    for i, f in enumerate(frames):
        if key in f:
            n += 1
            callers = frames[i:i+depth]
            c[' <- '.join(x[:70] for x in callers)] += 1
            break
for line in open(path, errors='replace'):
    line=line.rstrip('\n')
    if not line.strip():
        flush(); frames=[]; continue
    if not line.startswith((' ', '\t')):
        frames=[]; continue
    parts=line.strip().split(' ',1)
    sym=parts[1] if len(parts)>1 else '?'
    sym=re.sub(r'\+0x[0-9a-f]+$','',sym).strip(); sym=re.sub(r' \(.*\)$','',sym)
    frames.append(sym)
flush()
print(f'{key}: {100*n/total:.2f}% of {total}')
for p, m in c.most_common(12): print(f'{100*m/total:5.2f}% {p}')
