// Client-side caching through saltshaker: a Zipf(1.1) read load over 100,000 keys from
// node-redis with its client cache on, against the same load with it off, through the
// proxy over a pool. Prints, per mode: reads that reached the proxy and the nodes per
// 1,000 reads, p50/p99 read latency, the busiest node's share of the GETs, and how many
// keys the client cache held at the end. With --clients N, N applications read at once,
// each its own Zipf stream of `--reads` reads; the latency is over all of them and the
// keys held are given per client (smallest-largest).
//
// usage (from tests/node, where node-redis is installed):
//   node ../../bench/client_cache.mjs <proxy host:port> <admin host:port> <node>... \
//        [--reads N] [--mode on|off|both] [--clients N]
// node-redis is installed in tests/node (the tests pin it); resolve it from there.
import { createRequire } from 'module';
const { createClient, BasicClientSideCache } = createRequire(`${process.cwd()}/`)('redis');

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  if (i < 0) return dflt;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
};
const reads = Number(opt('--reads', '50000'));
const mode_arg = opt('--mode', 'both');
const clients = Number(opt('--clients', '1'));
const modes = mode_arg === 'both' ? ['off', 'on'] : [mode_arg];
const [proxy, admin, ...nodeAddrs] = args;
const KEYS = 100000;
const url = (a) => `redis://${a}`;

// Zipf(1.1) over KEYS ranks: the inverse of its CDF, by binary search.
const cdf = new Float64Array(KEYS);
let sum = 0;
for (let i = 0; i < KEYS; i++) { sum += 1 / Math.pow(i + 1, 1.1); cdf[i] = sum; }
// One stream per client: a linear congruential generator from its own seed.
const stream = (seed) => () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  const x = (seed / 2147483648) * sum;
  let lo = 0, hi = KEYS - 1;
  while (lo < hi) { const m = (lo + hi) >> 1; if (cdf[m] < x) lo = m + 1; else hi = m; }
  return lo;
};

const nodeGets = async (nodes) => {
  const out = [];
  for (const c of nodes) {
    const m = (await c.info('commandstats')).match(/cmdstat_get:calls=(\d+)/);
    out.push(m ? Number(m[1]) : 0);
  }
  return out;
};
const proxyRequests = async () => {
  const r = await fetch(`http://${admin}/metrics`);
  const t = await r.text();
  let n = 0;
  for (const l of t.split('\n')) if (l.startsWith('saltshaker_requests_total')) n += Number(l.split(' ').pop());
  return n;
};

const nodes = nodeAddrs.map((a) => createClient({ url: url(a) }));
for (const n of nodes) await n.connect();
const loader = createClient({ url: url(proxy) });
await loader.connect();
for (let i = 0; i < KEYS; i += 1000) {
  const batch = [];
  for (let j = i; j < Math.min(KEYS, i + 1000); j++) batch.push(loader.set(`z:${j}`, `value-${j}`));
  await Promise.all(batch);
}
await loader.quit();

console.log(`| client cache | clients | reads | proxy requests / 1000 reads | node GETs / 1000 reads | p50 us | p99 us | busiest node's share | keys held per client |`);
console.log('|---|---|---|---|---|---|---|---|---|');
for (const mode of modes) {
  const apps = [];
  for (let c = 0; c < clients; c++) {
    const cache = mode === 'on' ? new BasicClientSideCache({ ttl: 0, maxEntries: 0 }) : undefined;
    const app = createClient({ url: url(proxy), RESP: 3, ...(cache ? { clientSideCache: cache } : {}) });
    await app.connect();
    apps.push({ app, cache, zipf: stream(42 + c) });
  }
  const g0 = await nodeGets(nodes);
  const p0 = await proxyRequests();
  const lat = new Float64Array(reads * clients);
  await Promise.all(apps.map(async ({ app, zipf }, c) => {
    for (let i = 0; i < reads; i++) {
      const k = `z:${zipf()}`;
      const t = process.hrtime.bigint();
      await app.get(k);
      lat[c * reads + i] = Number(process.hrtime.bigint() - t) / 1000;
    }
  }));
  const g1 = await nodeGets(nodes);
  const p1 = await proxyRequests();
  lat.sort();
  const all = reads * clients;
  const per = g1.map((v, i) => v - g0[i]);
  const total = per.reduce((a, b) => a + b, 0);
  const share = total ? Math.max(...per) / total : 0;
  const held = apps.map(({ cache }) => (cache ? cache.size() : 0));
  const heldText = clients === 1 ? `${held[0]}` : `${Math.min(...held)}-${Math.max(...held)}`;
  console.log(`| ${mode} | ${clients} | ${reads} | ${((p1 - p0) * 1000 / all).toFixed(0)} | ${(total * 1000 / all).toFixed(0)} | ${lat[Math.floor(all * 0.5)].toFixed(0)} | ${lat[Math.floor(all * 0.99)].toFixed(0)} | ${(share * 100).toFixed(0)}% | ${heldText} |`);
  for (const { app } of apps) await app.quit();
}
for (const n of nodes) await n.quit();
