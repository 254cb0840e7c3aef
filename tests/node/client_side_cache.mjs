// node-redis 5 with its client-side cache, through saltshaker: repeated GETs are served
// from the application's own cache (none reaches the node), and a write made on the node
// directly reaches the cache as an invalidation. Prints one JSON line for
// tests/node_clients.rs.
//
// usage: node client_side_cache.mjs <proxy host:port> <node host:port>
import { createClient, BasicClientSideCache } from 'redis';

const [proxy, node] = process.argv.slice(2);
const url = (a) => `redis://${a}`;
const gets = async (c) => {
  const s = await c.info('commandstats');
  const m = s.match(/cmdstat_get:calls=(\d+)/);
  return m ? Number(m[1]) : 0;
};

const cache = new BasicClientSideCache({ ttl: 0, maxEntries: 0 });
const app = createClient({ url: url(proxy), RESP: 3, clientSideCache: cache });
app.on('error', (e) => { console.error('app client error', e); });
const direct = createClient({ url: url(node) });
const out = {};
try {
  await app.connect();
  await direct.connect();
  await direct.set('csc:k', 'v1');
  out.first = await app.get('csc:k');
  const before = await gets(direct);
  for (let i = 0; i < 100; i++) await app.get('csc:k');
  out.node_gets_for_100 = (await gets(direct)) - before;
  out.hits = cache.stats().hitCount;
  await direct.set('csc:k', 'v2');
  const t0 = Date.now();
  out.after_write = await app.get('csc:k');
  while (out.after_write !== 'v2' && Date.now() - t0 < 2000) {
    await new Promise((r) => setTimeout(r, 10));
    out.after_write = await app.get('csc:k');
  }
  out.saw_write_ms = Date.now() - t0;
} catch (e) {
  out.error = String(e && e.message || e);
}
console.log(JSON.stringify(out));
await Promise.allSettled([app.quit(), direct.quit()]);
