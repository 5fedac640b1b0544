#include "stoker/text/chat_template.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stoker/errors.h"

namespace stoker::text {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

std::string render(std::string_view source, std::string_view context = "{}") {
  return ChatTemplate::parse(source).render(context).text;
}

// The message of the InvalidArgument that `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplateTest, PrintsValuesAsPython) {
  EXPECT_EQ(render("{{ 1 }} {{ 2.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ true }} {{ none }}"),
            "1 2.0 1e+20 0.30000000000000004 True None");
  EXPECT_EQ(render("{{ [1, 'a', none, (1,), {'k': \"it's\"}] }}"),
            "[1, 'a', None, (1,), {'k': \"it's\"}]");
  EXPECT_EQ(render("{{ x }}|{{ x is defined }}|{{ x | default('d') }}"), "|False|d");
  EXPECT_EQ(render("{{ m.content }}", R"({"m": {"content": "hé 🙂"}})"), "hé 🙂");
}

TEST(ChatTemplateTest, TrimsAndStripsBlocksAsTransformersConfiguresJinja) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("a\n  {% if true %}\n    b\n  {% endif %}\nc\n"), "a\n    b\nc");
  EXPECT_EQ(render("a  {% if true %}b{% endif %}  c"), "a  b  c");  // not at a line's start
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("{% if true +%}\nkept{% endif %}"), "\nkept");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(render("x\n\t {#- comment -#} \n y"), "xy");
  EXPECT_EQ(render("a\r\nb\n\n"), "a\nb\n");  // newlines normalized, one trailing newline dropped
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(ChatTemplateTest, LoopsHaveJinjaScopesAndLoopVariables) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.first }}"
                   "{{ loop.cycle('a', 'b') }};{% endfor %}"),
            "12Truea;21Falseb;30Falsea;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2232");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}",
                   R"({"d": {"a": 1, "b": [true]}})"),
            "a=1 b=[True] ");
  // A set inside a loop does not outlive its iteration; a namespace carries the value out.
  EXPECT_EQ(render("{% set n = 0 %}{% for i in range(3) %}{% set n = n + 1 %}{{ n }}{% endfor %}"
                   "{{ n }}"),
            "1110");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "3");
}

TEST(ChatTemplateTest, MacrosTakeDefaultsAndCallers) {
  EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=3) }}"),
            "1213");
  EXPECT_EQ(render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}x{% endcall %}"),
            "[x]");
}

TEST(ChatTemplateTest, FiltersAndMethods) {
  EXPECT_EQ(render("{{ {'b': 'é', 'a': [1, 2.5]} | tojson }}"), R"({"b": "é", "a": [1, 2.5]})");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ '  a b  '.strip().split(' ') }} {{ 'x,y'.split(',')[-1] | upper }}"),
            "['a', 'b'] Y");
  EXPECT_EQ(
      render("{{ u | selectattr('ok') | map(attribute='n') | join(', ') }}",
             R"({"u": [{"n": "a", "ok": true}, {"n": "b", "ok": false}, {"n": "c", "ok": 1}]})"),
      "a, c");
  EXPECT_EQ(render("{{ 'héllo'[::-1] }} {{ [3, 1, 2] | sort | list }}"), "olléh [1, 2, 3]");
}

TEST(ChatTemplateTest, GenerationSpansAreByteRangesOfTheOutput) {
  auto t = ChatTemplate::parse(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}");
  EXPECT_TRUE(t.marks_generation());
  RenderedChat r = t.render(R"({"messages": [{"role": "user", "content": "hé"},
      {"role": "assistant", "content": "🙂 ok"}, {"role": "user", "content": "x"},
      {"role": "assistant", "content": "y"}]})");
  ASSERT_EQ(r.generation.size(), 2u);
  auto text = [&](std::pair<size_t, size_t> s) {
    return r.text.substr(s.first, s.second - s.first);
  };
  EXPECT_EQ(text(r.generation[0]), "🙂 ok</s>");
  EXPECT_EQ(text(r.generation[1]), "y</s>");
  EXPECT_FALSE(ChatTemplate::parse("{{ x }}").marks_generation());
}

TEST(ChatTemplateTest, ParseErrorsNameOriginLineAndConstruct) {
  EXPECT_EQ(error_of([] { ChatTemplate::parse("a\n{{ x | pprint }}", "model.jinja"); }),
            "model.jinja:2:8: unsupported filter 'pprint'");
  EXPECT_EQ(error_of([] { ChatTemplate::parse("\n\n  {% include 'x' %}", "t"); }),
            "t:3:6: unsupported tag 'include' (chat templates render alone: no include, extends, "
            "import, block or do)");
  EXPECT_NE(error_of([] { ChatTemplate::parse("{% if x %}", "t"); }).find("t:1:"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ChatTemplate::parse("{{ x is frobnicated }}", "t");
            }).find("unsupported test 'frobnicated'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{% break %}", "t"); }).find("outside of a for"),
            std::string::npos);
}

TEST(ChatTemplateTest, RenderErrorsNameOriginAndLine) {
  auto t = ChatTemplate::parse("ok\n{{ m.x.y }}", "t");
  EXPECT_EQ(error_of([&] { t.render("{}"); }), "t:2:6: 'm' is undefined");
  EXPECT_EQ(error_of([&] { t.render(R"({"m": {}})"); }),
            "t:2:8: 'dict object' has no attribute 'x'");
  EXPECT_NE(error_of([] {
              ChatTemplate::parse("{{ l.append(1) }}").render(R"({"l": []})");
            }).find("unsafe"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{{ 1 + 'a' }}").render("{}"); }).find("1:"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("x").render("[1]"); }).find("not a JSON object"),
            std::string::npos);
  try {
    ChatTemplate::parse("{{ raise_exception('bad role: ' ~ r) }}").render(R"({"r": "x"})");
    FAIL() << "no TemplateError";
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "bad role: x");
  }
}

// Hostile templates end with an InvalidArgument, fast (fuzz_chat_template found none of these
// ending otherwise; the first four would hang or exhaust memory, the nesting would overflow the
// stack).
TEST(ChatTemplateTest, HostileTemplatesAreBounded) {
  auto contains = [](const std::string& message, const char* part) {
    return message.find(part) != std::string::npos;
  };
  const auto render_error = [](const std::string& source) {
    return error_of([&] { ChatTemplate::parse(source, "t").render("{}"); });
  };
  EXPECT_EQ(render("{{ ''*10**18 }}|{{ []*10**18 }}|{{ 'ab'*2 }}{{ [1]*2 }}"), "|[]|abab[1, 1]");
  EXPECT_TRUE(contains(render_error("{{ 'ab'*4611686018427387904 }}"), "repeated string too long"));
  EXPECT_TRUE(contains(render_error("{{ ([1, 2]*1000000)|length }}"), "repeated list too long"));
  const char* steps = "steps of work";
  EXPECT_TRUE(
      contains(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                            "{% endfor %}"),
               steps));
  EXPECT_TRUE(contains(
      render_error("{% for i in range(100000) %}{% set s = range(100000)|join %}{% endfor %}"),
      steps));
  EXPECT_TRUE(
      contains(render_error("{% for i in range(100000) %}{{ 'x'*100000 }}{% endfor %}"), steps));
  EXPECT_EQ(render("{% for i in range(100000) %}{% endfor %}{{ range(5)|join }}"), "01234");

  const auto nested = [](const std::string& open, const std::string& middle,
                         const std::string& close, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += open;
    s += middle;
    for (int i = 0; i < n; ++i) s += close;
    return s;
  };
  for (const auto& [open, middle, close] : std::vector<std::array<std::string, 3>>{
           {"(", "1", ")"}, {"[", "", "]"}, {"not ", "1", ""}, {"-", "1", ""}}) {
    EXPECT_NO_THROW(render("{{ " + nested(open, middle, close, 50) + " }}"));
    EXPECT_TRUE(contains(
        error_of([&] { ChatTemplate::parse("{{ " + nested(open, middle, close, 20000) + " }}"); }),
        "nested deeper than 600 parser levels"));
  }
  EXPECT_EQ(render(nested("{% if 1 %}", "x", "{% endif %}", 50)), "x");
  EXPECT_TRUE(contains(
      error_of([&] { ChatTemplate::parse(nested("{% if 1 %}", "x", "{% endif %}", 5000)); }),
      "nested deeper than 600 parser levels"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += "|abs";
  EXPECT_TRUE(contains(render_error(chain + " }}"), "expressions nested deeper than 1000"));
}

TEST(ChatTemplateTest, RendersFromManyThreadsAtOnce) {
  auto t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{% generation %}{{ m.content | upper }}{% endgeneration %}{% endfor %}{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<char> ok(8, 0);
  for (size_t k = 0; k < ok.size(); ++k) {
    threads.emplace_back([&, k] {
      std::string id = std::to_string(k);
      std::string context = R"({"messages": [{"content": "a)" + id + R"("}, {"content": "b"}]})";
      bool all = true;
      for (int i = 0; i < 200; ++i) {
        RenderedChat r = t.render(context);
        all = all && r.text == "A" + id + "B2" &&
              r.generation == Spans{{0, 1 + id.size()}, {1 + id.size(), 2 + id.size()}};
      }
      ok[k] = all;
    });
  }
  for (auto& th : threads) th.join();
  for (size_t k = 0; k < ok.size(); ++k) EXPECT_TRUE(ok[k]) << k;
}

}  // namespace
}  // namespace stoker::text
