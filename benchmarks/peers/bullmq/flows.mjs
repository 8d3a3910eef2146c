// BullMQ producer for the peers harness's flow workload (benchmarks/peers/flowload.py):
// node flows.mjs URL plain|fan|chain N. Prints one JSON line: {t0 (epoch s, just before the
// first add), enqueue_s}.
//   plain: N 'job's, Queue.addBulk 1,000 per call (as producer.mjs fill);
//   fan:   FlowProducer.add of one parent 'fsink' with N children 'fnoop' (one flow);
//   chain: FlowProducer.add of a C-deep tree: each 'cstep' has the previous step as its one
//          child (BullMQ has no chain primitive: "trees of arbitrary depth" are how a
//          sequence is written, docs.bullmq.io/guide/flows); the root, run last, has last: true.
import { FlowProducer, Queue } from "bullmq";
import IORedis from "ioredis";

const [url, what, nArg] = process.argv.slice(2);
const n = Number(nArg);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const queue = new Queue("bench", { connection });
const flows = new FlowProducer({ connection });
await queue.waitUntilReady();
const t0 = Date.now() / 1000;
const p0 = process.hrtime.bigint();
if (what === "plain") {
  for (let s = 0; s < n; s += 1000) {
    const batch = [];
    for (let i = s; i < Math.min(n, s + 1000); i++) batch.push({ name: "job", data: { n: i } });
    await queue.addBulk(batch);
  }
} else if (what === "fan") {
  const children = [];
  for (let i = 0; i < n; i++) children.push({ name: "fnoop", queueName: "bench", data: {} });
  await flows.add({ name: "fsink", queueName: "bench", data: {}, children });
} else if (what === "chain") {
  let node = { name: "cstep", queueName: "bench", data: {} };
  for (let i = 1; i < n; i++) {
    node = { name: "cstep", queueName: "bench", data: { last: i === n - 1 }, children: [node] };
  }
  if (n === 1) node.data.last = true;
  await flows.add(node);
} else {
  throw new Error(`unknown flow ${what}`);
}
const enqueueS = Number(process.hrtime.bigint() - p0) / 1e9;
await flows.close();
await queue.close();
await connection.quit();
console.log(JSON.stringify({ t0, enqueue_s: enqueueS }));
process.exit(0);
