import json,glob,statistics,sys,collections
out=sys.argv[1]
d=collections.defaultdict(dict)
for f in sorted(glob.glob(out+'/*.json')):
    mode,rep=f.split('/')[-1][:-5].rsplit('_',1)
    j=json.load(open(f))
    if mode=='torch': d['torch'][int(rep)]=j['step_ms']['median']
    else:
        for r in j['results']: d[mode+'/'+r['strategy']][int(rep)]=r['step_ms']['median']
for k,v in sorted(d.items()): print(k, 'median %.1f'%statistics.median(v.values()), ' '.join('%.0f'%v[x] for x in sorted(v)))
def paired(a,b):
    if a in d and b in d:
        rs=[d[a][r]/d[b][r] for r in d[a] if r in d[b]]
        print(f'{a} / {b}: median paired ratio {statistics.median(rs):.3f}  ', ' '.join('%.2f'%x for x in rs))
for s in ('ddp','zero3'):
    paired('torch','off/'+s); paired('torch','on/'+s); paired('off/'+s,'on/'+s)
