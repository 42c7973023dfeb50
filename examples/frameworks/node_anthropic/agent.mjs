// The calc agent in Node.js with Anthropic's official `@anthropic-ai/sdk` package.
//
// The tool-use loop as Anthropic's docs write it, streamed: `client.messages.stream`
// with `system`, `tools` (`input_schema`) and a required `max_tokens`, its
// `finalMessage()`; while the `stop_reason` is `tool_use`, the reply's `content` goes
// back as the assistant turn and each `tool_use` block is answered by a `tool_result`
// block. The client reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (tether sets both:
// the rollout's base URL without /v1, and its token); the task comes from
// TETHER_TASK; the final answer is the last line of stdout.
//
//   npm install   # once, in this folder
//   ANTHROPIC_BASE_URL=http://127.0.0.1:8321 ANTHROPIC_API_KEY=$RECORD_KEY \
//   TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \
//   node agent.mjs

import Anthropic from "@anthropic-ai/sdk";

const MODEL = "policy";
const MAX_CALLS = 4;
const SYSTEM_PROMPT =
  "You are a math assistant. Use the calculator, then reply: The answer is N.";

const tools = [
  {
    name: "calculator",
    description: "Evaluate an arithmetic expression.",
    input_schema: {
      type: "object",
      properties: { expression: { type: "string", description: "e.g. 12 * (3 + 4)" } },
      required: ["expression"],
    },
  },
];

// A small recursive-descent evaluator for + - * / and parentheses (no eval).
function evaluate(expression) {
  const tokens = expression.match(/\d+(?:\.\d+)?|[-+*/()]|\S/g) ?? [];
  let pos = 0;
  const peek = () => tokens[pos];
  const take = () => tokens[pos++];
  function factor() {
    const t = take();
    if (t === "-") return -factor();
    if (t === "+") return factor();
    if (t === "(") {
      const v = sum();
      if (take() !== ")") throw new Error("missing )");
      return v;
    }
    if (t !== undefined && /^\d/.test(t)) return Number(t);
    throw new Error(`unexpected ${t === undefined ? "end" : JSON.stringify(t)}`);
  }
  function product() {
    let v = factor();
    while (peek() === "*" || peek() === "/") {
      const op = take();
      const r = factor();
      if (op === "/" && r === 0) throw new Error("division by zero");
      v = op === "*" ? v * r : v / r;
    }
    return v;
  }
  function sum() {
    let v = product();
    while (peek() === "+" || peek() === "-") v = take() === "+" ? v + product() : v - product();
    return v;
  }
  const value = sum();
  if (pos !== tokens.length) throw new Error(`unexpected ${JSON.stringify(peek())}`);
  return Number.isInteger(value) ? String(value) : String(Number(value.toFixed(6)));
}

function calculator(input) {
  try {
    const { expression } = input;
    if (typeof expression !== "string" || expression.length > 200) {
      throw new Error("expression must be a string of at most 200 characters");
    }
    return evaluate(expression);
  } catch (err) {
    return `error: ${err.message}`;
  }
}

async function solve(client, question) {
  const messages = [{ role: "user", content: question }];
  let answer = "";
  for (let i = 0; i < MAX_CALLS; i++) {
    const stream = client.messages.stream({
      model: MODEL,
      max_tokens: 128,
      system: SYSTEM_PROMPT,
      tools,
      messages,
    });
    const response = await stream.finalMessage();
    answer = response.content
      .filter((block) => block.type === "text")
      .map((block) => block.text)
      .join("");
    if (response.stop_reason !== "tool_use") break;
    messages.push({ role: "assistant", content: response.content });
    const results = response.content
      .filter((block) => block.type === "tool_use")
      .map((block) => {
        const content =
          block.name === "calculator"
            ? calculator(block.input)
            : `error: unknown tool ${block.name}`;
        return { type: "tool_result", tool_use_id: block.id, content, is_error: content.startsWith("error:") };
      });
    messages.push({ role: "user", content: results });
  }
  return answer.trim();
}

const task = JSON.parse(process.env.TETHER_TASK);
const client = new Anthropic(); // ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY
console.log((await solve(client, task.question)).replaceAll("\n", " "));
