// Chat templates (ChatTemplate::parse, then render) and the JSON contexts they render.
//
// The input is split by FuzzedDataProvider: the template source (a random-length string), then
// the context's JSON text (the rest). Checked: parse throws nothing but InvalidArgument; render
// throws nothing but InvalidArgument (TemplateError among them: raise_exception); a rendering's
// generation spans lie inside its text, begin <= end; the renderer's limits (nesting, work,
// output, chat_template.h) keep every input finite: libFuzzer's -timeout and -rss_limit_mb catch
// a hang or a runaway allocation.
#include <fuzzer/FuzzedDataProvider.h>

#include <optional>
#include <string>

#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  using stoker::text::ChatTemplate;
  FuzzedDataProvider p(data, size);
  const std::string source = p.ConsumeRandomLengthString();
  const std::string context = p.ConsumeRemainingBytesAsString();

  std::optional<ChatTemplate> chat_template;
  try {
    chat_template.emplace(ChatTemplate::parse(source, "fuzz"));
  } catch (const stoker::InvalidArgument&) {
    return 0;
  }
  (void)chat_template->marks_generation();
  try {
    const stoker::text::RenderedChat r = chat_template->render(context);
    for (const auto& [begin, end] : r.generation)
      require(begin <= end && end <= r.text.size(), "a generation span outside the text");
  } catch (const stoker::InvalidArgument&) {
  }
  return 0;
}
