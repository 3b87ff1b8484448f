// node-redisson (npm), driven by tests/backends.rs through stdin and stdout: one command a line,
// one answer a line, in order. Run: `node interop.js <port>` with NODE_PATH naming the
// node_modules folder that holds node-redisson and ioredis (.ci/run installs them).
//
//   hold NAME      lock() with node-redisson's watchdog         -> "held NAME"
//   try NAME MS    tryLock(MS): waits up to MS for the lock      -> "got NAME" | "refused NAME"
//   release NAME   unlock()                                      -> "released NAME"
//   quit           closes its connections                        -> "bye"
'use strict';

const readline = require('node:readline');
const { Redisson } = require('node-redisson');

async function main() {
  const port = Number(process.argv[2]);
  const redisson = new Redisson({ redis: { options: { host: '127.0.0.1', port } } });
  const locks = new Map();
  const lockOf = (name) => {
    if (!locks.has(name)) locks.set(name, redisson.getLock(name));
    return locks.get(name);
  };
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, name, ms] = line.trim().split(/\s+/);
    try {
      if (command === 'hold') {
        await lockOf(name).lock();
        console.log(`held ${name}`);
      } else if (command === 'try') {
        const got = await lockOf(name).tryLock(Number(ms));
        console.log(`${got ? 'got' : 'refused'} ${name}`);
      } else if (command === 'release') {
        await lockOf(name).unlock();
        console.log(`released ${name}`);
      } else if (command === 'quit') {
        await redisson.quit();
        console.log('bye');
        break;
      } else {
        console.log(`error unknown command ${command}`);
      }
    } catch (error) {
      console.log(`error ${String(error).replace(/\n/g, ' ')}`);
    }
  }
  process.exit(0);
}

main().catch((error) => {
  console.log(`error ${String(error).replace(/\n/g, ' ')}`);
  process.exit(1);
});
