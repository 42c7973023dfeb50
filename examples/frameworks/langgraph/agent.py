"""The calc agent as a LangGraph ReAct graph over LangChain's ``ChatOpenAI``.

Built the way LangGraph's docs build a tool-calling agent: a ``StateGraph``
over ``MessagesState`` with a model node (``ChatOpenAI(...).bind_tools``) and
a prebuilt ``ToolNode``, joined by ``tools_condition``. ``ChatOpenAI`` reads
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. Prints the final answer as the
last line of stdout.

    OPENAI_BASE_URL=http://127.0.0.1:8321/v1 OPENAI_API_KEY=$RECORD_KEY \\
    TETHER_TASK='{"question": "Ava has 12 apples and gets 30 more. How many?"}' \\
    python examples/frameworks/langgraph/agent.py
"""

from __future__ import annotations

import json
import os

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tether.starter.calc import SYSTEM_PROMPT
from tether.starter.calc import calculator as evaluate

MODEL = "policy"
MAX_CALLS = 4


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. 12 * (3 + 4)
    """
    return evaluate(expression)


def build_graph():
    llm = ChatOpenAI(model=MODEL, max_tokens=128)  # OPENAI_BASE_URL, OPENAI_API_KEY
    llm_with_tools = llm.bind_tools([calculator])

    def agent(state: MessagesState) -> dict:
        return {"messages": [llm_with_tools.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def solve(question: str) -> str:
    messages = [SystemMessage(SYSTEM_PROMPT), HumanMessage(question)]
    try:
        # Each model call and each tool step is a graph step.
        state = build_graph().invoke({"messages": messages}, {"recursion_limit": 2 * MAX_CALLS})
    except GraphRecursionError:
        return ""
    return str(state["messages"][-1].content).strip()


def main() -> None:
    task = json.loads(os.environ["TETHER_TASK"])
    print(solve(task["question"]).replace("\n", " "))


if __name__ == "__main__":
    main()
