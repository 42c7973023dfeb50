// The calc agent in Node.js with the official `openai` npm package.
//
// The same loop as examples/calc/agent.py, in another language: the client
// reads OPENAI_BASE_URL and OPENAI_API_KEY, the task comes from TETHER_TASK,
// calculator tool calls run locally, and the final answer is the last line
// of stdout.
//
//   npm install   # once, in this folder
//   OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \
//   TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \
//   node agent.mjs

import OpenAI from "openai";

const MODEL = "policy";
const MAX_CALLS = 4;
const SYSTEM_PROMPT =
  "You are a math assistant. Use the calculator, then reply: The answer is N.";

const tools = [
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression.",
      parameters: {
        type: "object",
        properties: {
          expression: { type: "string", description: "e.g. 12 * (3 + 4)" },
        },
        required: ["expression"],
      },
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

function calculator(args) {
  try {
    const { expression } = JSON.parse(args);
    if (typeof expression !== "string" || expression.length > 200) {
      throw new Error("expression must be a string of at most 200 characters");
    }
    return evaluate(expression);
  } catch (err) {
    return `error: ${err.message}`;
  }
}

async function solve(client, question) {
  const messages = [
    { role: "system", content: SYSTEM_PROMPT },
    { role: "user", content: question },
  ];
  let answer = "";
  for (let i = 0; i < MAX_CALLS; i++) {
    const response = await client.chat.completions.create({
      model: MODEL,
      messages,
      tools,
      max_tokens: 128,
    });
    const message = response.choices[0].message;
    answer = message.content ?? "";
    if (!message.tool_calls?.length) break;
    messages.push(message);
    for (const call of message.tool_calls) {
      const content =
        call.function.name === "calculator"
          ? calculator(call.function.arguments)
          : `error: unknown tool ${call.function.name}`;
      messages.push({ role: "tool", tool_call_id: call.id, content });
    }
  }
  return answer.trim();
}

const task = JSON.parse(process.env.TETHER_TASK);
const client = new OpenAI(); // OPENAI_BASE_URL, OPENAI_API_KEY
console.log((await solve(client, task.question)).replaceAll("\n", " "));
